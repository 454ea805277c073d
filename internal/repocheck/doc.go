// Package repocheck holds tests over the repository's own files: rules that
// no compiler checks but every change must keep.
package repocheck
