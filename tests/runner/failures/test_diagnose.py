"""Deterministic recipe failures become fatal RecipeErrors with the fix; a peer's failure is a broken group."""

from types import SimpleNamespace

import pytest

from resilient_train.errors import EXIT_FATAL, EXIT_GROUP_BROKEN, GroupBrokenError, RecipeError, exit_code_for
from resilient_train.runner.failures.diagnose import explain, group_broken


class Counter:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


class OutOfRangeError(Exception):
    """Stands for tf.errors.OutOfRangeError (recognised by name)."""


class UnavailableError(Exception):
    """Not TensorFlow's: a recipe's own class of the same name is never a broken group."""


def test_a_short_dataset_names_the_batch_count_and_repeat():
    trainer = SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(28))
    error = explain(OutOfRangeError("End of sequence"), recipe_name="digits", trainer=trainer, steps_per_epoch=60)
    assert str(error) == (
        "recipe digits: dataset() yielded 28 batches for epoch 0; steps_per_epoch is 60: "
        "add .repeat() (or lower --steps-per-epoch)"
    )


def test_an_op_at_import_is_named():
    error = explain(RuntimeError("Collective ops must be configured at program startup"),
                    recipe_name="bad", trainer=None, steps_per_epoch=None)
    assert str(error).startswith("recipe bad runs a TensorFlow op at import")


def test_anything_else_is_left_alone():
    trainer = SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(3))
    assert explain(ValueError("boom"), recipe_name="r", trainer=trainer, steps_per_epoch=10) is None
    assert explain(OutOfRangeError("End of sequence"), recipe_name="r", trainer=None, steps_per_epoch=10) is None


class StagingError(Exception):
    """Stands for autograph's wrapper of an exception raised while tracing."""


def test_a_recipe_error_raised_while_tracing_is_taken_back_out():
    wrapped = StagingError(
        "in user code:\n\n    File \"loop.py\", line 238, in step_fn  *\n        per_example = ...\n\n"
        "    RecipeError: recipe r: loss() must return one value per example, got shape (); fix it\n"
    )
    error = explain(wrapped, recipe_name="r", trainer=None, steps_per_epoch=10)
    assert str(error) == "recipe r: loss() must return one value per example, got shape (); fix it"


# --- a broken group: TensorFlow's peer-failure errors become GroupBrokenError (exit 4) ---

_SOCKET_CLOSED = (
    "Graph execution error:\n\nDetected at node while/CollectiveReduceV2_1 defined at (most recent call last):\n"
    '  File "loop.py", line 305, in train_call\n\n'
    "Collective ops is aborted by: Socket closed\n"
    "The error could be from a previous operation. Restart your program to reset.\n"
    "\t [[{{node while/CollectiveReduceV2_1}}]] [Op:__inference_train_call_1077]"
)


def _tf_error(name: str, message: str) -> Exception:
    import tensorflow as tf

    return getattr(tf.errors, name)(None, None, message)


@pytest.mark.parametrize("name", ["UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError"])
def test_each_peer_failure_type_out_of_a_collective_is_a_broken_group(name):
    broken = group_broken(_tf_error(name, _SOCKET_CLOSED))
    assert isinstance(broken, GroupBrokenError)
    assert str(broken) == (f"the worker group broke: {name} at node while/CollectiveReduceV2_1: "
                           "Collective ops is aborted by: Socket closed")
    assert exit_code_for(broken) == EXIT_GROUP_BROKEN
    assert type(broken.__cause__).__name__ == name  # TensorFlow's traceback stays in the error file


def test_another_tensorflow_error_that_says_the_collective_aborted_is_a_broken_group():
    broken = group_broken(_tf_error("InternalError", "Collective ops is aborted by: failed to connect to all addresses"))
    assert str(broken) == ("the worker group broke: InternalError: "
                           "Collective ops is aborted by: failed to connect to all addresses")


def test_a_heartbeat_failure_keeps_the_unhealthy_task():
    message = ("Graph execution error:\n\nDetected at node while/CollectiveReduceV2 defined at:\n"
               "Error reported from /job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats):\n"
               "/job:worker/replica:0/task:1\nThe tasks have crashed. Check the task logs for an earlier error.")
    assert str(group_broken(_tf_error("UnavailableError", message))) == (
        "the worker group broke: UnavailableError at node while/CollectiveReduceV2: Error reported from "
        "/job:worker/task:1: The following tasks are unhealthy (stopped sending heartbeats): /job:worker/replica:0/task:1")


def test_a_deadline_without_detail_keeps_its_first_line():
    broken = group_broken(_tf_error("DeadlineExceededError", "Collective has timed out waiting for other workers."))
    assert str(broken) == "the worker group broke: DeadlineExceededError: Collective has timed out waiting for other workers."


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(None, id="InvalidArgumentError"),  # a recipe's shape bug: TensorFlow's, not a peer's
        ConnectionResetError("Connection reset by peer"),  # the recipe's own download
        UnavailableError("Socket closed"),  # a recipe's class of the same name
        ValueError("loss is NaN"),
    ],
)
def test_anything_else_is_not_a_broken_group(exc):
    if exc is None:
        exc = _tf_error("InvalidArgumentError", "Incompatible shapes: [8,10] vs. [8,1]")
    assert group_broken(exc) is None


# ------------------------------------------- a failure before a fresh start's first step
class InvalidArgumentError(Exception):
    """Stands for tf.errors.InvalidArgumentError (a graph execution error's message)."""


class ResourceExhaustedError(Exception):
    """Stands for tf.errors.ResourceExhaustedError (out of memory: a restart may cure it)."""


def fresh(untrained):
    return SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(0), untrained_fresh_start=untrained)


TRACED_RANK_ERROR = ValueError(
    "in user code:\n\n    File \"loop.py\", line 376, in step_fn  *\n        per_example = ...\n"
    "    File \"keras/src/backend/tensorflow/nn.py\", line 1461, in binary_crossentropy\n        raise ValueError(\n\n"
    "    ValueError: Arguments `target` and `output` must have the same rank (ndim). Received: "
    "target.shape=(None,), output.shape=(None, 1)\n"
)


def test_a_failure_before_the_first_step_of_a_fresh_start_is_the_jobs_bug_in_one_line():
    error = explain(TRACED_RANK_ERROR, recipe_name="r", trainer=fresh(True), steps_per_epoch=10)
    assert isinstance(error, RecipeError) and exit_code_for(error) == EXIT_FATAL
    assert str(error) == (
        "recipe r: failed before the first training step of a fresh start (a bug in the job, not a fault: a restart "
        "fails the same way): ValueError: Arguments `target` and `output` must have the same rank (ndim). "
        "Received: target.shape=(None,), output.shape=(None, 1)"
    )


def test_a_fit_script_is_named_by_its_file():
    error = explain(KeyError("units"), recipe_name="train", trainer=fresh(True), steps_per_epoch=10,
                    job_label="Script /jobs/train.py")
    assert str(error).startswith("Script /jobs/train.py: failed before the first training step of a fresh start")
    assert str(error).endswith(": KeyError: 'units'")


def test_a_graph_execution_error_keeps_the_ops_message():
    exc = InvalidArgumentError("Graph execution error:\n\nDetected at node GatherV2 defined at (most recent call "
                               "last):\n  File \"r.py\", line 20, in <module>\n\nindices[0] = 10 is not in [0, 3)\n"
                               "\t [[{{node GatherV2}}]] [Op:__inference_h_25]")
    error = explain(exc, recipe_name="r", trainer=fresh(True), steps_per_epoch=10)
    assert str(error).endswith("): InvalidArgumentError: indices[0] = 10 is not in [0, 3)")


@pytest.mark.parametrize("trainer", [fresh(False), None, SimpleNamespace(epoch=Counter(0), step_in_epoch=Counter(0))],
                         ids=["after_a_step_or_a_restore", "before_the_trainer", "no_flag"])
def test_the_same_failure_once_a_step_finished_or_after_a_restore_stays_restartable(trainer):
    assert explain(TRACED_RANK_ERROR, recipe_name="r", trainer=trainer, steps_per_epoch=10) is None


@pytest.mark.parametrize("exc", [ConnectionResetError("peer reset"), TimeoutError("slow"), OSError("disk"),
                                 MemoryError(), ResourceExhaustedError("OOM when allocating")],
                         ids=lambda e: type(e).__name__)
def test_a_failure_a_restart_may_cure_stays_restartable_even_before_the_first_step(exc):
    assert explain(exc, recipe_name="r", trainer=fresh(True), steps_per_epoch=10) is None
