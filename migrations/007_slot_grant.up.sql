-- The token reservation (limiter grant) that goes with a held limiter slot, so the delivery that
-- sends at the slot can reconcile it with the provider's reported usage.
ALTER TABLE jobs ADD COLUMN slot_grant bigint;
