"""Test and benchmark support, kept outside the shipped packages.

- ``gateway``: run a gateway as a subprocess on a free loopback port;
- ``batches``: build v2 record batches byte by byte;
- ``txn``: a transaction coordinator over a real storage engine, reopened
  between test phases;
- ``cli``: run ``kafka-gateway`` commands in a subprocess;
- ``describe_transactions``: DescribeTransactions responses kio cannot read.
"""
