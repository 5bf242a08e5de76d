-- An attempt's lease: the delivery that began the current attempt holds the job until
-- lease_until (it renews the lease while the call runs). Another delivery of the same job (a
-- re-enqueue after Redis lost its task, say) may begin an attempt only once the lease has ended,
-- so one job never has two provider calls in flight.
ALTER TABLE jobs ADD COLUMN lease_token uuid, ADD COLUMN lease_until timestamptz;
