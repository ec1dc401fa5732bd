"""txlog: Kafka's transactions without a Kafka cluster, on object storage.

    log = txlog.connect("/data/lake")            # or s3://bucket/root, gs://, abfs://
    log.create_topic("orders", partitions=4)
    p = log.producer(transactional_id="etl-1")
    p.init_transactions(); p.begin_transaction()
    p.send("orders", b"...", key=b"k"); p.commit_transaction()
    c = log.consumer(group_id="g", isolation_level="read_committed")
"""

from txlog import errors
from txlog.log import Log, TopicInfo, connect
from txlog.records import Record, TopicPartition

__all__ = ["Log", "Record", "TopicInfo", "TopicPartition", "connect", "errors"]
__version__ = "0.3.0"
