"""Attempt-scoped storage faults for chaos runs (put on PYTHONPATH by resilient_train.chaos.harness only).

``RT_FAULTFS`` (read by resilient_train.chaos.faultfs) has no notion of attempts: a
torn upload armed through it would tear every attempt's upload and the job could never
finish. The supervisor passes its environment to every attempt unchanged, so the chaos
harness sets ``RT_CHAOS_FAULTFS`` = ``{"<attempt>" or "*": {faultfs options}}`` instead, and
this module, which Python imports at start-up in every worker, turns the entry for this
process's ``RT_ATTEMPT`` into ``RT_FAULTFS``. The supervisor has no ``RT_ATTEMPT`` and so
never sees faults (its storage check and summary reads stay clean).

Remove once faultfs scopes faults by attempt itself.
"""

import json
import os

_plan = os.environ.get("RT_CHAOS_FAULTFS")
_attempt = os.environ.get("RT_ATTEMPT")
if _plan and _attempt:
    _spec = json.loads(_plan)
    _mine = _spec.get(_attempt, _spec.get("*"))
    if _mine is not None:
        os.environ["RT_FAULTFS"] = json.dumps(_mine)
    else:
        os.environ.pop("RT_FAULTFS", None)
