"""The `dllm-ais` subcommands' flags, checks and runs (one module per concept); dllm_ais/cli.py builds the parser."""
