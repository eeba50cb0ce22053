"""Writes a GGUF file's weights back as F32, value for value (Q4_K, BF16, ... decoded with gguf-py's
own decoders), keeping every key. llama.cpp then multiplies in fp32 instead of quantising its
activations to 8 bits (Q4_K) or rounding them to bf16, so the agreement run can separate the
model's conventions (this file: both sides should agree to fp32 rounding) from llama.cpp's own
activation rounding (the original file).

    widen.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

src, dst = sys.argv[1], sys.argv[2]
r = GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = GGUFWriter(dst, arch)
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    vtype = field.types[0]
    sub = field.types[1] if vtype == GGUFValueType.ARRAY and len(field.types) > 1 else None
    w.add_key_value(key, field.contents(), vtype, sub)
def widened(t):
    if t.tensor_type == GGMLQuantizationType.F32:
        return np.asarray(t.data, dtype=np.float32)
    return dequantize(t.data, t.tensor_type).astype(np.float32)


# Streamed: tensor infos first, then one tensor at a time (a full-width file does not fit in memory
# as F32).
for t in r.tensors:
    shape = [int(d) for d in reversed(t.shape)]  # gguf-py's numpy order: outermost first
    w.add_tensor_info(t.name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_ti_data_to_file()
for t in r.tensors:
    w.write_tensor_data(widened(t).reshape([int(d) for d in reversed(t.shape)]))
w.close()
