"""optimize's stages, each a module whose functions pipeline.py alone calls, in this order
(no stage calls another, or back up):

  request.py   what was asked: the options read and checked, before any work
  load.py      the MODEL argument -> a loaded model, and where its output goes
  export.py    the loaded model -> the ONNX graph (and torch's own float64 run of it)
  rewrite.py   the rules applied, constant folding, runtime fusions kept
  check.py     validation against the float64 result, and the rewrite to blame where it fails
  half.py      --dtype fp16: the validated model in half precision, chosen by measured error
  measure.py   the profile of both graphs, judged against its noise
  write.py     the optimized model written (its weights first, for a large one)

and what several of them take: inputs.py (the input sets the checks and the profile run on),
report.py (the report's sections no single stage writes).
"""
