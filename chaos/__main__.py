"""``python -m chaos``, typed at the root of a checkout: the same command as ``python -m resilient_train.chaos``.

The chaos engine is the package's (resilient_train/chaos/); this directory holds the scenario files
a user reads, copies and runs, and this one file so that the command is spelled where they live.
It hands the command line to the package's ``main`` unchanged: same arguments, same exit codes,
the same catalogue (``chaos/scenarios``, found next to the ``resilient_train`` package). ``chaos/``
is not installed (pyproject packages ``resilient_train*`` only): the command works where the
current directory is the checkout's root, which ``python -m`` puts first on ``sys.path``;
anywhere else, use ``python -m resilient_train.chaos``.
"""

import sys

from resilient_train.chaos.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
