"""`--backend ray`: every sweep point as a Ray task on a private local instance, same results."""
from __future__ import annotations

import pytest

from core.lab.__main__ import main
from core.lab.sweep import run_sweep
from core.lab.workloads import make_workload


def small() -> "object":
    return make_workload("generated-shared-prefix", num_groups=4, prompts_per_group=6, system_prompt_len=256,
                         question_len=16, output_len=8)


def test_a_ray_sweep_gives_exactly_the_local_results():
    w = small()
    local = run_sweep(w, [600, 1200, 2400], ["lru", "fifo"], workers=1)
    seen, inside = [], []
    on_ray = run_sweep(w, [600, 1200, 2400], ["lru", "fifo"], workers=2, backend="ray",
                       progress=lambda done, total, row: seen.append((done, total)),
                       point_progress=lambda task, fraction: inside.append((task["policy"], fraction)))
    cols = [c for c in local.table().columns if c != "seconds"]
    assert on_ray.table()[cols].equals(local.table()[cols])
    assert on_ray.infinite.hit_tokens == local.infinite.hit_tokens
    assert seen == [(i, 9) for i in range(1, 10)]          # 6 replays + 3 optimum points, each reported once
    assert {p for p, _ in inside} == {"lru", "fifo"} and all(0 <= f <= 1 for _, f in inside)


def test_bad_backend_and_stray_address_are_one_line_errors(capsys):
    with pytest.raises(ValueError, match="unknown backend 'spark'"):
        run_sweep(small(), [600], ["lru"], backend="spark")
    assert main(["sweep", "--workload", "few-shot", "--capacities", "1000", "--address", "10.0.0.1:6379"]) == 2
    assert "add --backend ray" in capsys.readouterr().err


def test_a_private_ray_instance_keeps_its_files_in_its_own_folder_and_removes_it(monkeypatch):
    import os
    import shutil
    import tempfile

    from core.lab.ray_backend import TEMP_PREFIX
    root = tempfile.mkdtemp(prefix="t", dir="/tmp")         # short: Ray's socket paths live below it
    monkeypatch.setenv("TMPDIR", root)
    monkeypatch.setattr(tempfile, "tempdir", None)          # gettempdir() reads TMPDIR again
    during: list[list[str]] = []

    def look(done: int, total: int, row: dict) -> None:
        if done == 1:
            mine = os.listdir(root)
            during.append(mine + sorted(os.listdir(os.path.join(root, mine[0]))) if len(mine) == 1 else mine)
    try:
        run_sweep(small(), [600], ["lru"], workers=1, backend="ray", progress=look)
        assert len(during) == 1 and during[0][0].startswith(TEMP_PREFIX)
        assert any(name.startswith("session_") for name in during[0][1:])   # Ray's session folder is in it
        assert os.listdir(root) == []                                       # and gone with the instance
    finally:
        shutil.rmtree(root, ignore_errors=True)
