"""PySpark pipelines for tablequeue: enqueue a dataset, drain a work queue, report on its history.

Every job talks to the queues only through the procedure contract (tablequeue.client.QueueClient);
the report reads the history and dead-letter tables, which the contract opens for analytics.
See docs/pipelines.md for how to run them locally and with spark-submit.
"""
