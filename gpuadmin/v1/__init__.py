"""Generated from protos/gpuadmin/v1/*.proto by protos/generate.py."""
