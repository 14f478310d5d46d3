import sys

try:  # Ctrl-C while the command's first module loads ends as it does later (console.py)
    from .console import main
except KeyboardInterrupt:
    sys.stderr.write("convexport: interrupted\n")
    raise SystemExit(130) from None

main()
