"""Idle GPUs, intruders, `gpulock metrics --pool` and `gpulock serve` on the Redis backend: the
same reports as with lock files, from a real redis-server (conftest_redis)."""

import json

from prometheus_client.parser import text_string_to_metric_families

from conftest import wait_until
from test_serve import get, start_serve

pytest_plugins = ["conftest_redis"]


def test_idle_intruders_metrics_and_serve_on_the_redis_backend(rw):
    gl = rw.gl
    path = gl.write_fake_gpus([{}, {}])
    config = gl.tmp / "config.toml"
    config.write_text('idle_after = "1s"\n')
    env = rw.env(host="node-a", gpus=path, GPULOCK_CONFIG=config)
    holder = rw.hold("--gpus", "0", env=env)
    intruder = gl.sleeper()
    gl.write_fake_gpus([{"processes": [{"pid": intruder.popen.pid}]}, {}])

    def idle_status():
        doc = rw.status(env=env)
        return doc if doc["gpus"][0]["idle"] else None
    doc = wait_until(idle_status, what="GPU 0 to be idle")
    assert doc["backend"] == "redis"
    assert [(i["pid"], i["gpu"], i["lease_id"]) for i in doc["intruders"]] == [
        (intruder.popen.pid, "0", holder.lease_id)]

    result = gl.run("metrics", "--pool", env=env)
    assert result.returncode == 0, result.stderr
    families = {f.name: f for f in text_string_to_metric_families(result.stdout)}
    assert [s.labels["pid"] for s in families["gpulock_intruder_info"].samples] == [
        str(intruder.popen.pid)]
    assert [s.labels["host"] for s in families["gpulock_gpu_lease_info"].samples] == ["node-a"]

    server = start_serve(gl, env=env)
    served = json.loads(get(server.port, "/api/status")[2])
    assert served["backend"] == "redis"
    assert [i["pid"] for i in served["intruders"]] == [intruder.popen.pid]
