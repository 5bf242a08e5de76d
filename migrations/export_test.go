package migrations

// UpWith is upWith, for the tests' made-up migrations.
var UpWith = upWith
