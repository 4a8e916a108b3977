"""One module per subcommand of ``resilient-train`` (cli.py builds the parser from them).

Each module has ``add_parser(subparsers)``, which adds its subcommand(s) and sets
``handler=main``, and ``main(args) -> int``, which does the work and returns the exit code
(errors.py). Heavy imports (TensorFlow, the supervisor) stay inside ``main`` so that
``--help`` and argument errors are fast.

    run.py     run       the supervisor on local workers
    worker.py  worker    one worker under another launcher (runner.process.worker_main.run)
    check.py   check     input determinism (runner/input/check_input.py)
    verify.py  verify, ls   checkpoints under a storage URL (--deep: restored into the recipe)
    diff.py    diff      the first committed step where two runs diverge
    export.py  export    a committed checkpoint as a model
    doctor.py  doctor    this machine, before training
"""
