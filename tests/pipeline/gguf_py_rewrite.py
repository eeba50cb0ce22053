"""Rewrites a GGUF file with gguf-py's own writer (llama.cpp's Python package): every key as read,
Q4_K and F32 tensors byte for byte, BF16 tensors widened to F32 (exact), so that a test can load
what gguf-py wrote and compare the arena with the one the first file gave.

    gguf_py_rewrite.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize

r = GGUFReader(sys.argv[1])
w = GGUFWriter(sys.argv[2], r.fields["general.architecture"].contents())
for key, field in r.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY and len(field.types) > 1 else None
    w.add_key_value(key, field.contents(), field.types[0], sub)
for t in r.tensors:
    shape = [int(d) for d in reversed(t.shape)]
    if t.tensor_type == GGMLQuantizationType.BF16:
        w.add_tensor(t.name, dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape))
    else:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
