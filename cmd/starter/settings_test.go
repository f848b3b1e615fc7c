package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/keyedhq/keyed/internal/config"
)

// TestHelpFollowsTheSettings checks the starter's help against the
// settings table: 'starter help' lists every variable all commands read and
// names those single commands read; each command's -h lists the flags of
// the settings it reads (a group's all or none, for a command that omits
// it) and no other setting's, and the variables only it reads.
func TestHelpFollowsTheSettings(t *testing.T) {
	t.Parallel()
	_, top, _ := starter(t, nil, "help")
	var commandBits config.Uses
	for _, c := range commands() {
		commandBits |= config.CommandUses(c.name)
	}
	for _, s := range config.Settings {
		require.Zero(t, s.For&^(config.InWorker|config.InStarter|config.InTests|commandBits),
			"%s is read by a starter command that does not exist", s.Env)
		if s.For&config.InStarter != 0 {
			require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(s.Env)+`( |$)`, top)
		} else if s.For&commandBits != 0 {
			require.Contains(t, top, s.Env)
		}
	}

	flagLine := regexp.MustCompile(`(?m)^  --([a-z-]+)`)
	for _, c := range commands() {
		_, out, _ := starter(t, nil, c.name, "-h")
		flags, env, _ := strings.Cut(out, "\nEnvironment of ")
		listed := map[string]bool{}
		for _, m := range flagLine.FindAllStringSubmatch(flags, -1) {
			listed[m[1]] = true
		}
		uses := config.InStarter | config.CommandUses(c.name)
		groups := map[config.FlagGroup][]bool{}
		for _, s := range config.Settings {
			switch {
			case s.Flag == "":
			case s.For&uses == 0:
				require.False(t, listed[s.Flag], "%s lists --%s, a setting it does not read", c.name, s.Flag)
			case s.Group == 0:
				require.True(t, listed[s.Flag], "%s lists --%s", c.name, s.Flag)
			default:
				groups[s.Group] = append(groups[s.Group], listed[s.Flag])
			}
			if s.For&config.CommandUses(c.name) != 0 {
				require.Regexp(t, `(?m)^  `+regexp.QuoteMeta(s.Env)+`( |$)`, env, "%s -h lists %s", c.name, s.Env)
			}
		}
		for g, shown := range groups {
			for _, sh := range shown {
				require.Equal(t, shown[0], sh, "%s lists all of group %d's flags or none", c.name, g)
			}
		}
	}
}
