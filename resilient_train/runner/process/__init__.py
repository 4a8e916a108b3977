"""The worker's process, around its training: how it starts, waits, hears of its end and leaves.

``worker_main`` is the worker (argv or job file, TF_CONFIG, the wiring, the exit code);
``bootstrap`` is the start-up and the one exit (``exit_process``) that every worker, warm standby
and parameter-server process shares; ``warm_standby`` is a process with TensorFlow imported,
waiting for its worker argv, and ``standby_template`` the one process per run that imports once
and forks each standby; ``preemption_notices`` turns this node's cloud notices into the worker's
stop request; ``startup_phases`` says where a worker's start-up time went, up to its first step;
``ps_roles`` is the parameter-server tier's coordinator, parameter servers and workers.
"""
