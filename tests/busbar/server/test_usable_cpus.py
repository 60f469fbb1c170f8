"""The default worker count follows the CPUs the process may use and its container's CPU limit
(busbar/supervisor.py usable_cpus), not the node's core count."""
import os

from busbar.supervisor import usable_cpus


def test_no_limit_is_the_affinity(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("max 100000\n")
    assert usable_cpus(str(f)) == len(os.sched_getaffinity(0))
    assert usable_cpus(str(tmp_path / "absent")) == len(os.sched_getaffinity(0))


def test_a_cpu_limit_caps_it_rounded_up(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("50000 100000\n")       # half a CPU: one worker
    assert usable_cpus(str(f)) == 1
    f.write_text("150000 100000\n")      # 1.5 CPUs: two workers, unless fewer are usable
    assert usable_cpus(str(f)) == min(2, len(os.sched_getaffinity(0)))


def test_garbage_in_the_file_is_ignored(tmp_path):
    f = tmp_path / "cpu.max"
    f.write_text("lots\n")
    assert usable_cpus(str(f)) == len(os.sched_getaffinity(0))
