"""Test and benchmark support, kept outside the shipped packages.

- ``gateway``: run a gateway as a subprocess on a free loopback port;
- ``batches``: build v2 record batches byte by byte;
- ``txn``: a transaction coordinator over a real storage engine, reopened
  between test phases;
- ``cli``: run ``kafka-gateway`` commands in a subprocess;
- ``prom``: read a /metrics page with Prometheus' own parser;
- ``readme_run``: run the README's commands and code blocks in order;
- ``describe_transactions``: DescribeTransactions responses kio cannot read.
"""
