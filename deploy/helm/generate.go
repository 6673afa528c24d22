// Package helm holds bothy's Helm chart (bothy/, docs/cluster.md "Install and operate") and
// its tests, which render it with a helm built by scripts/helm/build and apply the result to
// a real kube-apiserver. The package has no Go code of its own to import: it is the chart's
// home in the module so that `go generate ./...` keeps the chart's generated parts current and
// `go test` checks it.
//
// The chart's CRDs (bothy/crds/) and its roles' rules (bothy/files/rbac/) are not written by
// hand: they are copies of what controller-gen generates into cluster/config from the Go
// types and the parts' +kubebuilder:rbac markers. go generate runs the packages in import
// path order, so cluster/api/v1alpha1's controller-gen runs before this copy.
package helm

//go:generate go run ./gen ../../cluster/config bothy
