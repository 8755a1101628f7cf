package sriov

// Stepwise makes n move links with separate requests, as on a kernel that
// refuses a rename with the move.
func Stepwise(n *Netns) { n.stepwise = true }
