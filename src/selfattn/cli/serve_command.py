"""The command line's ``serve``: the live app in the browser."""

from __future__ import annotations

import argparse

SERVE_EXAMPLES = """examples:
  selfattn serve                                   the built-in models at http://127.0.0.1:8765/
  selfattn serve --model ./my-decoder              one of your own beside them (a folder, a .bin, a cached hub id)
  selfattn serve --model ./a ./stories15M.bin      several: folders, checkpoints, cached hub ids
  selfattn serve --port 0 --no-browser             a free port, printed; no browser opened
"""


def add_serve_command(commands) -> None:
    """Add ``serve`` to the subcommands."""
    serve = commands.add_parser(
        "serve",
        help="the live app: type, step a generation, knock out heads, in the browser",
        description=(
            "Start a local web app: the seed's walkthrough for any variant, any model's attention for a text "
            "you type, generation one token at a time with the key/value cache drawn, and heads knocked out. "
            "It offers all-MiniLM-L6-v2, tiny-induction, tiny-shakespeare and stories260K, and the models "
            "given with --model; each loads when first used. Nothing leaves this machine. Ctrl-C stops it."
        ),
    )
    serve.epilog = SERVE_EXAMPLES
    serve.add_argument("--host", default="127.0.0.1", metavar="HOST",
                       help="the address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8765, metavar="PORT", help="the port (default 8765; 0: a free one)")
    serve.add_argument("--model", dest="models", action="extend", nargs="+", default=[], metavar="NAME_OR_PATH",
                       help="more models to offer: a folder in the Hugging Face layout, a llama2.c checkpoint "
                       "(.bin) or a hub id already in the local cache (repeat or list several)")
    serve.add_argument("--no-browser", action="store_true", help="do not open the page in a browser")
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from selfattn.models.locate import model_key
    from selfattn.serve.run import check_port, serve

    for name in args.models:  # before torch loads: a model that is not there, or a port out of range
        model_key(name)
    check_port(args.port)

    return serve(args.host, args.port, args.models, browser=not args.no_browser)
