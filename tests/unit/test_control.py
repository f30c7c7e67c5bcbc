"""The control topic's records as a follower reads them: revisions only increase."""

from __future__ import annotations

from agents.model.control import KEY, ControlFollower, encode
from agents.model.deployment import Deployment, DeploymentError, ModelRef

MODEL = ModelRef("/srv/seam/models/fraud-mlp.onnx", "0" * 64)


def record(revision: int) -> bytes:
    return encode(Deployment(revision, MODEL, command="deploy"))


def test_a_revision_not_above_the_highest_read_is_refused_and_a_higher_one_is_served() -> None:
    """An old deployment record written again cannot take a fleet back (or a restarting worker elsewhere)."""
    follower = ControlFollower("127.0.0.1:1", "control")  # never started: records are handed to it
    latest = None
    for revision in (1, 2):
        latest = follower._read(KEY, record(revision), latest)
        assert isinstance(latest, Deployment) and latest.revision == revision
    for stale in (2, 1):  # the same revision again, an older one written anew
        assert follower._read(KEY, record(stale), latest) is latest  # read past (catching up): revision 2 stays
        refused = follower._read(KEY, record(stale), None)  # followed (a running worker): a refusal to report
        assert isinstance(refused, DeploymentError)
        assert f"revision {stale} does not follow revision 2" in str(refused)
    assert follower.highest_revision == 2
    served = follower._read(KEY, record(3), latest)
    assert isinstance(served, Deployment) and served.revision == 3
    assert follower._read(b"other-key", record(1), served) is served  # another key: ignored, not refused
