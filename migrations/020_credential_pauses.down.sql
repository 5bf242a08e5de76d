DROP TABLE credential_pauses;
