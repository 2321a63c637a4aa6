"""Side-by-side benchmark of the gateway against Apache Kafka and Tansu.

`python -m bench --help`
"""
