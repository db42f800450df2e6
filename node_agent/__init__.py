"""The node agent (`agent.py`): one standard-library file that every Swarm node runs, shipped as a
Swarm config by `queue_service.engine.node_agent_deploy`. Nothing here is imported by the agent itself."""
