"""``python -m langgraph_idem_saver`` / ``idem-saver``: the command line."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch sub-commands. ``demo`` runs the crash-and-resume demonstration."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(
            "usage: idem-saver demo [--dir DIR]\n\n  demo   crash a ReAct agent mid tool "
            "batch and resume it: stock ToolNode vs IdempotentToolNode"
        )
        return 0
    if args[0] == "demo":
        from langgraph_idem_saver.demo import main as demo_main

        return demo_main(args[1:])
    print(f"idem-saver: unknown command {args[0]!r} (try: idem-saver demo)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
