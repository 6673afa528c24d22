package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeHealth is a node's own verdict on whether it can take and serve sandboxes.
// +kubebuilder:validation:Enum=Healthy;Degraded;Unhealthy
type NodeHealth string

// The verdicts a node publishes.
const (
	// NodeHealthy: the node takes new sandboxes and serves its own.
	NodeHealthy NodeHealth = "Healthy"
	// NodeDegraded: the node serves its sandboxes but should take no new ones (its state
	// root is full, say).
	NodeDegraded NodeHealth = "Degraded"
	// NodeUnhealthy: the node cannot serve (its state root is unavailable).
	NodeUnhealthy NodeHealth = "Unhealthy"
)

// Capacity is an amount of a node's resources.
type Capacity struct {
	// MemoryMB is memory in MiB.
	MemoryMB int64 `json:"memoryMB"`
	// MilliCPU is CPU in thousandths of a CPU.
	MilliCPU int64 `json:"milliCPU"`
	// Sandboxes is a count of sandbox slots.
	Sandboxes int32 `json:"sandboxes"`
}

// Generation is a template generation a node holds.
type Generation struct {
	Template   string `json:"template"`
	Generation string `json:"generation"`
}

// BothyNodeSpec is what the operator decides about the node.
type BothyNodeSpec struct {
	// Cordoned: the node takes no new sandbox and keeps serving its own.
	// +optional
	Cordoned bool `json:"cordoned,omitempty"`
	// Draining: the node takes no new sandbox (it refuses creates, node-draining), its
	// sandboxes run until their lifetimes end, and at DrainDeadline it deletes those left.
	// Sandboxes are node-local and stateful: they are ended, not moved (docs/cluster.md).
	// +optional
	Draining bool `json:"draining,omitempty"`
	// DrainDeadline is when a draining node deletes the sandboxes it still holds; none: it
	// waits for them to end (their lifetimes, or their owners' deletes).
	// +optional
	DrainDeadline *metav1.Time `json:"drainDeadline,omitempty"`
}

// DrainStatus is how far a draining node is.
type DrainStatus struct {
	// Remaining is how many sandboxes the node still holds.
	Remaining int32 `json:"remaining"`
	// Drained: the node holds no sandbox; the operator may stop and remove it.
	Drained bool `json:"drained"`
	// Deadline is the drain's deadline as the node read it, if any.
	// +optional
	Deadline *metav1.Time `json:"deadline,omitempty"`
	// Deleted is how many sandboxes the node deleted at the deadline.
	// +optional
	Deleted int32 `json:"deleted,omitempty"`
}

// BothyNodeStatus is what the node publishes about itself.
type BothyNodeStatus struct {
	// Address is the URL of the node's API, where a router sends its sandboxes' calls.
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Address string `json:"address,omitempty"`
	// StartID names the node's process that wrote this status: a random id drawn at each
	// start, which the node also sets as its Lease's label cluster.bothy.dev/start-id at every
	// renewal. A router takes the node for live only when the two agree, so that a restarted
	// node whose lease reads live before its new address does is never sent calls at the old
	// one (docs/cluster.md, "Node mode").
	// +kubebuilder:validation:MaxLength=63
	// +optional
	StartID string `json:"startID,omitempty"`
	// Version is the node's bothyd version.
	// +kubebuilder:validation:MaxLength=128
	// +optional
	Version string `json:"version,omitempty"`
	// Capacity is what the node offers sandboxes in all.
	// +optional
	Capacity Capacity `json:"capacity,omitempty"`
	// Allocated is what the node's sandboxes hold: the limits of every sandbox that is not
	// stopped, and a slot for each sandbox.
	// +optional
	Allocated Capacity `json:"allocated,omitempty"`
	// Free is Capacity less Allocated, never below zero.
	// +optional
	Free Capacity `json:"free,omitempty"`
	// Sandboxes is how many sandboxes the node holds.
	// +optional
	Sandboxes int32 `json:"sandboxes,omitempty"`
	// Health is the node's verdict on itself; HealthMessage says why when it is not Healthy.
	// +optional
	Health NodeHealth `json:"health,omitempty"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	HealthMessage string `json:"healthMessage,omitempty"`
	// Images are the images the node holds, for placement to prefer it (at most 256).
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Images []string `json:"images,omitempty"`
	// ImagesIncomplete says the node holds more images than Images lists: placement takes
	// it for a possible holder of any image it does not list.
	// +optional
	ImagesIncomplete bool `json:"imagesIncomplete,omitempty"`
	// Generations are the template generations the node holds (at most 256), the newest
	// first.
	// +kubebuilder:validation:MaxItems=256
	// +optional
	Generations []Generation `json:"generations,omitempty"`
	// GenerationsIncomplete says the node holds more generations than Generations lists
	// (the oldest are left out): placement takes it for a possible holder of any
	// generation it does not list.
	// +optional
	GenerationsIncomplete bool `json:"generationsIncomplete,omitempty"`
	// Volumes are the names of the volumes the node holds: all of them, since a node holds
	// at most 256 (volume.MaxVolumes). A volume lives on one node; a router routes its calls,
	// and places the sandboxes that mount it, there (docs/cluster.md, "Volumes").
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	// +optional
	Volumes []string `json:"volumes,omitempty"`
	// Secrets are the names of the secrets the node holds: all of them, since a node holds
	// at most 256 (secret.MaxSecrets); never a value. A router places a sandbox whose policy
	// binds secrets on a node that holds them all (docs/cluster.md, "Secrets").
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=64
	// +optional
	Secrets []string `json:"secrets,omitempty"`
	// Drain is how far the drain is while the node drains; none otherwise.
	// +optional
	Drain *DrainStatus `json:"drain,omitempty"`
	// UpdatedAt is when the node last wrote this status, to the microsecond: placement
	// compares it with when its creates finished.
	// +optional
	UpdatedAt *metav1.MicroTime `json:"updatedAt,omitempty"`
}

// BothyNode is one node running bothyd in node mode; its name is the node's name, and the
// coordination.k8s.io Lease of the same name in the cluster's namespace says it is alive.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=bn,categories=bothy
// +kubebuilder:printcolumn:name="Health",type=string,JSONPath=`.status.health`
// +kubebuilder:printcolumn:name="Cordoned",type=boolean,JSONPath=`.spec.cordoned`
// +kubebuilder:printcolumn:name="Sandboxes",type=integer,JSONPath=`.status.sandboxes`
// +kubebuilder:printcolumn:name="Free-Slots",type=integer,JSONPath=`.status.free.sandboxes`
// +kubebuilder:printcolumn:name="Free-MiB",type=integer,JSONPath=`.status.free.memoryMB`
// +kubebuilder:printcolumn:name="Draining",type=boolean,JSONPath=`.spec.draining`,priority=1
// +kubebuilder:printcolumn:name="Drained",type=boolean,JSONPath=`.status.drain.drained`,priority=1
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.address`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type BothyNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec BothyNodeSpec `json:"spec,omitempty"`
	// +optional
	Status BothyNodeStatus `json:"status,omitempty"`
}

// BothyNodeList is a list of BothyNodes.
//
// +kubebuilder:object:root=true
type BothyNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []BothyNode `json:"items"`
}
