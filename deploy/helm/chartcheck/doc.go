// Package chartcheck renders and checks the Helm chart in ../skein from Go tests, with Helm's own
// packages (chart loader, values schema, template engine, linter) rather than the helm CLI. It is
// a module of its own so that skein's module does not carry Helm's dependencies.
package chartcheck
