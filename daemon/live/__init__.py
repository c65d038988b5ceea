"""The live shell: Kafka in, the engine, decisions out."""
