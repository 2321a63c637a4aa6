"""PySpark jobs that use the gateway through Spark's own Kafka source and sink."""
