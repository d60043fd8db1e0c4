"""``horovod.runner.elastic``: the constants and driver settings Horovod's elastic
integration tests import or patch, mapped to fastpsrun's elastic driver."""
