# `encore generate` on the tiny file: with a GPU it must generate and write every step's logits;
# without one it must say so and exit non-zero. -DENCORE=... -DMODEL=... -DOUT=... -DVOCAB=...
set(steps 5)
set(prompt 3,1,4)
execute_process(COMMAND ${ENCORE} generate --model ${MODEL} --prompt-ids ${prompt} --steps ${steps} --batch 2
                        --path ${PATH_KIND} --logits-out ${OUT}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  if(NOT out MATCHES "tokens/s" OR NOT out MATCHES "row 1:")
    message(FATAL_ERROR "generate succeeded but printed no tokens:\n${out}${err}")
  endif()
  file(SIZE ${OUT} bytes)
  math(EXPR want "(3 + ${steps} - 1) * 2 * ${VOCAB} * 4")
  if(NOT bytes EQUAL want)
    message(FATAL_ERROR "--logits-out wrote ${bytes} bytes, want ${want}")
  endif()
  message(STATUS "${out}")
elseif(err MATCHES "no CUDA device")
  message(STATUS "no GPU: ${err}")
else()
  message(FATAL_ERROR "generate failed (${rc}):\n${out}${err}")
endif()
