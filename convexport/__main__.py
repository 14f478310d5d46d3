import sys

try:  # Ctrl-C while the command's first module loads, or before its guard, ends as it does later (console.py)
    from .console import main

    main()
except KeyboardInterrupt:
    sys.stderr.write("convexport: interrupted\n")
    raise SystemExit(130) from None
