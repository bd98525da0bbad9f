"""The corpus campaign (issue 20, item 6): public CUDA programs built unmodified with their own build
files, then run plain, recorded, replayed and tuned on a GPU machine, in chunks that each fit one
time-limited device call, and merged into docs/corpus.json and docs/CORPUS.md.

Rooms: apps (the corpus's apps.tsv), stage (budget, subsets, result files, subprocesses), build (the
CPU stage and the bundle for the GPU machine), gpu (plain, record, replay, tune, ncu), schema (the
JSON Schema of docs/corpus.json), merge (stage results -> corpus.json), render (CORPUS.md), cli.

Run it as `bash scripts/corpus.sh STAGE [--apps A,B]` (or `python -m bench.corpus`).
"""
