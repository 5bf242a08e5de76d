DROP TABLE IF EXISTS provider_batch_files;
