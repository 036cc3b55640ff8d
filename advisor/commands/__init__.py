"""Subcommands of the `advisor` CLI: each module has add_parser(subparsers) and run(args)."""
