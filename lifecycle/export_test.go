package lifecycle

// SlowVMMEnv is slowEnv for the tests in package lifecycle_test: those
// drive the flows against a real node through local.Backend, and control
// imports lifecycle (its Backend embeds this package's).
const SlowVMMEnv = slowEnv
