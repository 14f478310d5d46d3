"""optimize's stages, each a module whose functions pipeline.py alone calls, in this order (no
stage calls another, or back up), each the entry of the package of the same name:

  load.py      the MODEL argument -> a loaded model by its route, where its output goes, and
               its ONNX graph (and torch's own float64 run of it)          convexport/load/
  rewrite.py   the rules applied, constant folding, runtime fusions kept   convexport/rewrite/
  validate.py  validation against the float64 result, and the rewrite to
               blame where it fails                                        convexport/validate/
  half.py      --dtype fp16: the validated model in half precision, chosen
               by measured error                                           convexport/half/
  profile.py   the profile of both graphs, judged against its noise        convexport/profile/
  report.py    the report's sections no single stage writes, and the
               optimized model written (its weights first, for a large one) convexport/report/

Before them, request.py reads and checks the options (what was asked, refused in the option's
words before any work); inputs.py is what several stages take (the input sets the checks and
the profile run on). Each stage hands back what it found, its report sections typed; pipeline.py
places them. A check that fails raises refusal.Refused with its sections.
"""
