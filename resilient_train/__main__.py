import sys

from resilient_train.cli import main

sys.exit(main())
