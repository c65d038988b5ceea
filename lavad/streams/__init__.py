"""Events and decisions on the wire, codecs, and trace/Kafka sources and sinks."""
