"""Small pieces every layer may use, importing none of them: the storage layer
(``tablets``), the protocol layer (``kafka_gateway``), the transaction
coordinator (``txn``) and ``spark_jobs`` (which the Spark image holds without the
gateway). Nothing here imports a package of this repository but ``common``.

- ``histogram.py``: the fixed-bucket histogram behind the latency metrics of the
  store and of the request path;
- ``key_value.py``: ``KEY=VALUE`` command-line arguments into a dict;
- ``logtext.py``: a string a client chose, escaped and cut for a log line.
"""
