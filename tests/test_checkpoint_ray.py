"""Checkpoint and resume of RayRunner (issue 18): a state of process copies loads into Ray
actors (as many), and each copy continues its own stream. Ray actors are seeded like worker
processes (by worker id), so the copies of the two runners are the same streams."""
import shutil
import tempfile

import pytest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

import dataflow as D                                                 # noqa: E402
from dataflow.parallel.ray import RayRunner                          # noqa: E402
from tests.test_checkpoint_runners import (SEED, N, build, check_copies, copy_df,  # noqa: E402
                                           take, through_json, uninterrupted)


@pytest.fixture(scope="module")
def ray_here():
    """A local Ray instance for this file only, shut down at its end if this fixture started
    it (other files' leak checks count child processes)."""
    started = not ray.is_initialized()
    if started:
        temp_dir = tempfile.mkdtemp(prefix="dataflow-test-ray-")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    yield ray
    if started:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(120)
def test_state_of_process_copies_resumes_in_ray_actors_and_back(ray_here):
    _, made = uninterrupted("processes", 4)
    D.set_seed(SEED)
    df = build("processes")
    df.reset_state()
    got, p = take(df, 27, 3)
    state = through_json(df.state_dict())
    df.close()
    D.set_seed(SEED)
    with RayRunner(copy_df(True), 2, num_prefetch=4) as r:
        r.load_state_dict(state)
        r.reset_state()
        more, q = take(r, 19, 3 - p)         # finishes pass 1, then 6 of pass 2
        got += more
        state = through_json(r.state_dict())
    with pytest.raises(ValueError, match="num_workers=2.*num_workers=3"):
        RayRunner(copy_df(True), 3).load_state_dict(state)
    D.set_seed(SEED)
    df = build("processes")
    df.load_state_dict(state)
    df.reset_state()
    try:
        got += [dp for _ in range(p + q, 3) for dp in df]
    finally:
        df.close()
    assert len(got) == 3 * N
    check_copies(got, made)
