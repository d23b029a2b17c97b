"""How agents and the server talk: messages, transport interfaces, stub and gRPC."""
