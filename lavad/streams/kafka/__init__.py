"""Kafka sources and sinks: topics, the embedded broker, trace publishing."""
