"""docker-compose.yml and the Dockerfile are consistent with the code.

No Docker engine runs here, so the compose file is checked for structure: the
services, the gateway's command (parsed by the real CLI parser), its health
check against the admin endpoint, and the Spark job it submits.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from kafka_gateway import config

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_services_and_dependencies():
    services = compose()["services"]
    assert set(services) == {"gateway", "spark-master", "spark-worker", "reshard-job"}
    assert services["gateway"]["build"] == "."
    job = services["reshard-job"]
    assert job["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    assert "gateway-data" in compose()["volumes"]


def test_gateway_command_is_accepted_by_the_cli():
    gateway = compose()["services"]["gateway"]
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    cfg = config.from_arguments(parser.parse_args(gateway["command"]))
    assert cfg.listen == ("0.0.0.0", 9092)
    assert cfg.advertised == ("gateway", 9092)
    assert cfg.data_dir == "/data"
    admin_port = cfg.admin_listen.rsplit(":", 1)[1]
    assert f"127.0.0.1:{admin_port}/health" in " ".join(gateway["healthcheck"]["test"])
    assert any(v.endswith(":/data") for v in gateway["volumes"])


def test_spark_job_submits_an_existing_script_with_the_connector():
    command = compose()["services"]["reshard-job"]["command"]
    script = next(arg for arg in command if arg.endswith(".py"))
    assert (ROOT / "spark_jobs" / Path(script).name).is_file()
    packages = command[command.index("--packages") + 1]
    assert packages.startswith("org.apache.spark:spark-sql-kafka-0-10_2.12:3.5")
    assert command[command.index("--bootstrap-servers") + 1] == "gateway:9092"


def test_dockerfile_installs_the_packages_and_serves():
    dockerfile = (ROOT / "Dockerfile").read_text()
    for package in ("kafka_gateway", "tablets", "txn"):
        assert f"COPY {package} ./{package}" in dockerfile
    assert 'ENTRYPOINT ["kafka-gateway", "serve"]' in dockerfile
