DROP TABLE tenant_previous_tokens;
