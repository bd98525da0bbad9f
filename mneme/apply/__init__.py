"""`mneme apply`: run an app with its tuned kernels swapped in at launch, no rebuild (docs/APPLY.md).

    wisdom.py    the wisdom file (schema, read, write, from a tune results directory)
    export.py    `mneme export`: a wisdom file from the best MLflow run of a sweep
    manifest.py  per kernel: which launches a configuration applies to, the manifest libapply reads
    prepare.py   the tuned cubins (from the tune's compile cache, or rebuilt from the recorded IR)
    runner.py    runs the app with and without native/apply/libapply.so and reads what it measured
    evidence.py  realized / predicted speedups, the campaign's summary, MLflow logging
    cli.py       `mneme apply TUNED... -- ./app ARGS`

This package imports nothing here, so `mneme.apply.wisdom` (which imports only mneme.config) can be used
by `mneme tune`'s report, a lower layer.
"""
