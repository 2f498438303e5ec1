"""One exception hierarchy for everything the planner reports to a user.

A ``PlannerError`` is the user's to fix: the CLI prints its message on one line
and exits with its ``exit_code``, 2 (3 for a job that failed on its cluster: ``JobFailed``; 4 for
one stopped on a straggler: ``StragglerFound``). Any
other exception is a bug and keeps its traceback.
"""


class PlannerError(Exception):
    """Base of every error caused by the user's input or situation."""

    exit_code = 2


class SchemaError(PlannerError):
    """A model, training, cluster, layout or plan value is missing, unknown or invalid."""


class OtherProfileError(SchemaError):
    """A plan read with a cluster profile of another cluster than the one it was made for."""


class ProfileError(PlannerError):
    """Profiling the cluster failed or produced an unusable profile."""


class InfeasibleConfigError(PlannerError):
    """A layout cannot run: it does not divide the model or the batch, or it does not fit in memory."""


class SearchError(PlannerError):
    """The search could not produce a plan."""


class MissingExtraError(PlannerError):
    """A command needs an optional dependency (torch, for profiling and running) that is not installed;
    the message names the extra that brings it."""


class DoesNotFitError(InfeasibleConfigError):
    """A layout that runs but needs more memory per rank than the device has to give."""

    def __init__(self, message: str, *, needed_bytes: float, usable_bytes: float) -> None:
        super().__init__(message)
        self.needed_bytes = needed_bytes
        self.usable_bytes = usable_bytes


class JobFailed(PlannerError):
    """A distributed job stopped because a rank died, hung or failed; the message names it."""

    exit_code = 3


class StragglerFound(JobFailed):
    """``planner run --on-fault exit`` stopped the job because a rank was far slower than its peers,
    or a link than the links carrying the same traffic; the message names it and its host(s). Its
    own code, so a launcher can tell it from a crash and re-plan without that rank or link."""

    exit_code = 4
