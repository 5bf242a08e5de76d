package api

import "time"

// authLogInterval is how often a tenant's refused credential may be logged (authLog), and a
// refusal of a tenant over its share (refusalLog).
const authLogInterval = time.Minute

// streamLogInterval is how often a failure of the event streams (a watch renewal, a read) may be
// logged, all streams together (see Server.streamLog).
const streamLogInterval = 10 * time.Second
