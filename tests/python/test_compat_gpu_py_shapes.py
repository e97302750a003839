"""`gpulock-gpu --get` in the shapes GPU.py's users write (issue: leases in shell scripts fail
closed and are never handed out twice). GPU.py's model is "held until --release"; gpulock-gpu
tied the lease to a guessed calling process, which in these shapes ended while the work went
on, so the next --get handed out the same GPU. The seed's own shape runs its 150 tasks on 4
simulated GPUs, the others 50 (each task starts two Pythons, one after the other: about 0.2 s a
task on a 2-core machine; the CLI's shapes run 150 each in tests/integration/
test_shell_leases.py, and the lease underneath is the same), audited by the tasks' own O_EXCL
markers (tests/support/sweep_audit.py): no GPU is held by
two tasks, none runs without one, and every GPU comes back when the script is done, or when
every process of its session is SIGKILLed."""

import os
import stat
import subprocess

import pytest

from conftest import HANG, PYTHON, wait_until
from sweep_audit import Audit, kill_session, session_processes

TASKS = 150  # the seed's: "I can have e.g. 150 tasks"
OTHER_TASKS = 50
SWEEP_HANG = 600  # hang guard of one sweep: each --get and --release starts a Python

# The seed's own pattern: the main loop gets a GPU id, the task runs in the background and
# gives it back. GPU.py's lease belonged to the `<(…)` subshell, gone at once.
SWEEP_READ_AND_BACKGROUND = r'''
for i in $(seq "$N"); do
  read -r I < <(gpulock-gpu --get) || exit
  (work.sh "$I" "$i"; gpulock-gpu --release "$I" > /dev/null) &
done
wait
'''

# os.system() from Python: the lease's asker is a `sh -c` that ends at once.
SWEEP_OS_SYSTEM = r'''
import os, subprocess, sys
n, audit = int(os.environ["N"]), os.environ["AUDIT"]
tasks = []
for i in range(1, n + 1):
    if os.system("gpulock-gpu --get > %s/id" % audit) != 0:
        sys.exit(1)
    gpu = open("%s/id" % audit).read().strip()
    tasks.append(subprocess.Popen(["sh", "-c", 'work.sh "$0" "$1"; gpulock-gpu --release "$0" '
                                   '> /dev/null', gpu, str(i)]))
sys.exit(max([t.wait() for t in tasks] + [0]))
'''

# make, one shell per recipe line: the line that gets the id has ended before the next starts.
MAKEFILE = r'''
TASKS := $(shell seq $(N))
all: $(addprefix task-,$(TASKS))
task-%:
	gpulock-gpu --get > $@.id
	work.sh $$(cat $@.id) $*
	gpulock-gpu --release $$(cat $@.id) > /dev/null
.PHONY: all
'''


@pytest.fixture
def audit(gl):
    """The audit, with `gpulock-gpu` (as pip installs the console script) and `work.sh` on
    PATH."""
    audit = Audit(gl.tmp / "audit")
    wrapper = audit.bin / "gpulock-gpu"
    wrapper.write_text("#!%s\nimport sys\nfrom gpulock.compat.gpu_py import main\n"
                       "sys.exit(main())\n" % PYTHON)
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return audit


def sweep_env(gl, audit, tasks, work_seconds="0.01"):
    env = audit.env(gl.env(GPULOCK_JOURNAL_DIR="off"), work_seconds)
    env["N"] = str(tasks)
    return env


def start(gl, audit, shape, tasks=TASKS, work_seconds="0.01"):
    env = sweep_env(gl, audit, tasks, work_seconds)
    if shape == "read-and-background":
        script = gl.write("sweep.sh", SWEEP_READ_AND_BACKGROUND)
        return gl.spawn_argv(["/bin/bash", script], env=env)
    if shape == "os-system":
        script = gl.write("sweep.py", SWEEP_OS_SYSTEM)
        return gl.spawn_argv([PYTHON, script], env=env)
    assert shape == "make"
    makefile = gl.write("Makefile", MAKEFILE)
    return gl.spawn_argv(["make", "-s", "-j", "8", "-f", makefile, "-C", str(gl.tmp)], env=env)


def all_gpus_free(gl):
    return subprocess.run([gl.binary, "run", "--gpus", "0,1,2,3", "--no-wait", "--", "true"],
                          env=gl.env(), capture_output=True, timeout=HANG).returncode == 0


@pytest.mark.parametrize("shape,tasks", [("read-and-background", TASKS),
                                         ("os-system", OTHER_TASKS), ("make", OTHER_TASKS)])
def test_get_in_every_shape_never_hands_a_gpu_out_twice(gl, audit, shape, tasks):
    sweep = start(gl, audit, shape, tasks)
    assert sweep.wait(timeout=SWEEP_HANG) == 0, sweep.describe()
    assert audit.errors() == []
    assert audit.done() == list(range(1, tasks + 1))
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")


def test_a_nohup_script_keeps_its_gpus_after_the_logout(gl, audit):
    script = gl.write("sweep.sh", SWEEP_READ_AND_BACKGROUND)
    login = gl.spawn_argv(["/bin/bash", "-c", 'nohup bash "$0" > "$0.log" 2>&1 & exit 0',
                           script], env=sweep_env(gl, audit, OTHER_TASKS))
    assert login.wait() == 0
    wait_until(lambda: not session_processes(login.pid), SWEEP_HANG, what="the sweep to end")
    assert audit.errors() == []
    assert audit.done() == list(range(1, OTHER_TASKS + 1))
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")


@pytest.mark.parametrize("shape", ["read-and-background", "make"])
def test_killing_the_whole_session_gives_every_gpu_back(gl, audit, shape):
    sweep = start(gl, audit, shape, work_seconds="1000")
    wait_until(lambda: len(audit.running()) == 4, SWEEP_HANG, what="four tasks at work")
    assert kill_session(sweep.pid) >= 4
    sweep.wait()
    wait_until(lambda: all_gpus_free(gl), HANG, what="the GPUs to come back")
    assert audit.errors() == [] and audit.done() == []
