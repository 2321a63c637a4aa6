"""Security: listeners and TLS, SASL authentication, ACL authorization (docs/security.md)."""
