"""docker-compose.yml and the Dockerfiles are consistent with the code.

No Docker engine runs here, so the compose file is checked for structure: the
services, their images or builds, ports, commands (parsed by the real CLI
parsers of the gateway and of spark_jobs), volumes, depends_on and the
gateway's health check; and every Spark version in it (the images, the
connector it submits with) is the pinned pyspark's. The profile `cluster`:
PostgreSQL and three gateways over it (docs/cluster.md), each command parsed
by the gateway's CLI.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

import yaml

from kafka_gateway import settings
from spark_jobs.__main__ import parser as jobs_parser

ROOT = Path(__file__).resolve().parent.parent
SPARK_SERVICES = {"spark-master", "spark-worker", "feeder", "reshard-job"}
CLUSTER_GATEWAYS = ("gw1", "gw2", "gw3")


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def pinned_pyspark(extra: str = "spark") -> str:
    """The pyspark pin of the `spark` extra (the default line) or of `spark35`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    [pin] = [req for req in extras[extra] if req.startswith("pyspark")]
    return pin.split("==")[1]


def test_each_pyspark_line_has_its_connector_pom():
    """The two extras pin Spark 4 and Spark 3.5, and each connector pom the
    version and Scala build of its extra's pyspark (what run_all.sh resolves)."""
    for extra, pom in (("spark", "spark"), ("spark35", "spark35")):
        version = pinned_pyspark(extra)
        text = (ROOT / "compat_tests" / "jvm" / pom / "pom.xml").read_text()
        assert f"<spark.version>{version}</spark.version>" in text, extra
        assert f"<scala.binary.version>{scala(version)}</scala.binary.version>" in text, extra
    assert pinned_pyspark("spark").startswith("4.")
    assert pinned_pyspark("spark35").startswith("3.5.")


def scala(version: str) -> str:
    """The Scala build of a Spark release (pip's pyspark, the images, the connector)."""
    return "2.13" if int(version.split(".")[0]) >= 4 else "2.12"


def job_command(service: str) -> argparse.Namespace:
    """The spark_jobs arguments of a service's command, parsed by the real parser."""
    command = compose()["services"][service]["command"]
    start = next(i for i, arg in enumerate(command)  # python3 -m spark_jobs, or spark-submit
                 if arg == "spark_jobs" or arg.endswith("spark_jobs/__main__.py"))
    return jobs_parser().parse_args(command[start + 1:])


def test_services_and_dependencies():
    services = compose()["services"]
    default = {name for name, service in services.items() if "profiles" not in service}
    assert default == {"gateway"} | SPARK_SERVICES
    assert set(services) - default == {"postgres", *CLUSTER_GATEWAYS}
    assert services["gateway"]["build"] == "."
    job = services["reshard-job"]
    assert job["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert job["depends_on"]["spark-worker"]["condition"] == "service_started"
    assert services["feeder"]["depends_on"]["gateway"]["condition"] == "service_healthy"
    assert services["spark-worker"]["depends_on"] == ["spark-master"]
    assert {"gateway-data", "reshard-checkpoints"} <= set(compose()["volumes"])


def gateway_settings(service: dict) -> settings.GatewayConfig:
    """A gateway service's command, parsed by the gateway's own CLI."""
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.from_arguments(parser.parse_args(service["command"]))


def test_gateway_command_is_accepted_by_the_cli():
    gateway = compose()["services"]["gateway"]
    cfg = gateway_settings(gateway)
    assert cfg.listen == ("0.0.0.0", 9092)
    assert cfg.advertised == ("gateway", 9092)
    assert cfg.data_dir == "/data"
    admin_port = cfg.admin_listen.rsplit(":", 1)[1]
    assert f"127.0.0.1:{admin_port}/health" in " ".join(gateway["healthcheck"]["test"])
    assert gateway["ports"] == [f"{admin_port}:{admin_port}"]
    assert any(v.endswith(":/data") for v in gateway["volumes"])


def test_spark_services_share_one_image_of_the_pinned_spark():
    services = compose()["services"]
    version = pinned_pyspark()
    for name in SPARK_SERVICES:
        service = services[name]
        assert service["build"] == {"context": ".", "dockerfile": "spark.Dockerfile"}, name
        assert service["image"] == f"kafka-gateway-spark:{version}", name
    dockerfile = (ROOT / "spark.Dockerfile").read_text()
    image = f"apache/spark:{version}-scala{scala(version)}-java17-python3-ubuntu"
    assert re.search(rf"^FROM {re.escape(image)}$", dockerfile,
                     re.M), "spark.Dockerfile's Spark must be the pinned pyspark's"
    assert "COPY spark_jobs /opt/kafka-gateway/spark_jobs" in dockerfile
    # the package beside spark_jobs it imports (common.key_value), on PYTHONPATH
    assert "COPY common /opt/kafka-gateway/common" in dockerfile
    assert "ENV PYTHONPATH=/opt/kafka-gateway" in dockerfile
    assert "confluent-kafka" in dockerfile
    pom = (ROOT / "compat_tests" / "jvm" / "spark" / "pom.xml").read_text()
    assert f"<spark.version>{version}</spark.version>" in pom
    # ... and the PySpark the README recommends.
    assert f"PySpark {version}" in (ROOT / "README.md").read_text()


def test_spark_cluster_master_and_worker():
    services = compose()["services"]
    master = services["spark-master"]["command"]
    assert master[:2] == ["/opt/spark/bin/spark-class", "org.apache.spark.deploy.master.Master"]
    assert master[master.index("--port") + 1] == "7077"
    assert services["spark-master"]["ports"] == [f"{master[master.index('--webui-port') + 1]}"
                                                 ":8080"]
    worker = services["spark-worker"]["command"]
    assert worker[:3] == ["/opt/spark/bin/spark-class", "org.apache.spark.deploy.worker.Worker",
                          "spark://spark-master:7077"]


def test_reshard_job_submits_the_launcher_with_the_matching_connector():
    service = compose()["services"]["reshard-job"]
    command = service["command"]
    assert command[0] == "/opt/spark/bin/spark-submit"
    assert command[command.index("--master") + 1] == "spark://spark-master:7077"
    packages = command[command.index("--packages") + 1]
    version = pinned_pyspark()
    assert packages == f"org.apache.spark:spark-sql-kafka-0-10_{scala(version)}:{version}"
    script = next(arg for arg in command if arg.endswith(".py"))
    assert script == "/opt/kafka-gateway/spark_jobs/__main__.py"  # where the image copies it
    assert (ROOT / "spark_jobs" / "__main__.py").is_file()
    args = job_command("reshard-job")
    assert args.job == "reshard"
    assert args.bootstrap_servers == "gateway:9092"
    checkpoint_volume = next(v for v in service["volumes"] if v.startswith("reshard-checkpoints:"))
    assert args.checkpoint.startswith(checkpoint_volume.split(":", 1)[1] + "/")
    assert "/checkpoints" in (ROOT / "spark.Dockerfile").read_text()  # owned by spark


def test_feeder_feeds_the_reshard_jobs_source():
    feeder = compose()["services"]["feeder"]
    assert feeder["command"][:3] == ["python3", "-m", "spark_jobs"]
    args = job_command("feeder")
    assert args.job == "feed"
    assert args.bootstrap_servers == "gateway:9092"
    assert args.topic == job_command("reshard-job").source
    assert args.count > 0


def test_cluster_profile_three_gateways_over_one_postgresql():
    services = compose()["services"]
    postgres = services["postgres"]
    assert postgres["profiles"] == ["cluster"]
    assert postgres["image"].startswith("postgres:") and int(
        postgres["image"].split(":")[1]) >= 15  # docs/cluster.md: PostgreSQL 15 or newer
    env = postgres["environment"]
    assert "pg_isready" in postgres["healthcheck"]["test"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "postgres-data" in compose()["volumes"]
    node_ids, admin_ports = set(), set()
    for name in CLUSTER_GATEWAYS:
        service = services[name]
        assert service["profiles"] == ["cluster"], name
        assert service["build"] == ".", name
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert service["environment"]["PGPASSWORD"] == env["POSTGRES_PASSWORD"], name
        cfg = gateway_settings(service)
        assert cfg.store == (f"postgresql://{env['POSTGRES_USER']}@postgres:5432/"
                             f"{env['POSTGRES_DB']}"), name
        assert cfg.advertised == (name, 9092), name  # the service's name on the network
        assert cfg.listen == ("0.0.0.0", 9092), name
        node_ids.add(cfg.node_id)
        admin_port = cfg.admin_listen.rsplit(":", 1)[1]
        assert f"127.0.0.1:{admin_port}/health" in " ".join(service["healthcheck"]["test"])
        [published] = service["ports"]
        host_port, container_port = published.split(":")
        assert container_port == admin_port, name
        admin_ports.add(host_port)
    assert len(node_ids) == len(admin_ports) == len(CLUSTER_GATEWAYS)
    assert services["gateway"]["ports"][0].split(":")[0] not in admin_ports


def test_dockerfile_installs_the_packages_and_serves():
    dockerfile = (ROOT / "Dockerfile").read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    for pattern in packages:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}" in dockerfile
    assert "[postgres]" in dockerfile  # asyncpg, for --store postgresql://
    assert 'ENTRYPOINT ["kafka-gateway", "serve"]' in dockerfile
