"""The gRPC API's server (`gpuadmin grpc`): the calls' plumbing (who calls, refusals as status
codes), the state changes that streams follow, and the server the apps' servicers join."""
