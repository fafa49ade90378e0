# helpdoc.awk - turns a program's --help text into its man page
# (mode=man) or its bash completion (mode=bash), so neither can drift from
# the program: the build runs the program it just linked and pipes the
# output through here (packaging/CMakeLists.txt). POSIX awk (mawk works).
#
#   PROG --help | awk -f helpdoc.awk -v mode=man -v prog=NAME \
#       -v summary="one line" -v version=V -v date=YYYY-MM-DD \
#       -v description="a paragraph" -v seealso="embps(1)"
#   PROG --help | awk -f helpdoc.awk -v mode=bash -v prog=NAME
#
# The help layout it reads (both programs use it):
#   usage: PROG SYNOPSIS            first line; lines indented 4 or more
#          ...SYNOPSIS continued    spaces right after it continue it
#     ITEM  DESCRIPTION             two-space indent: an option (--flag
#                                   ARG) or a command (name ARGS); the
#                                   description starts after two spaces
#                                   or at column 28
#        ...continuation            deeper indent: the description goes on
#                                   (or, for an item without one, its
#                                   arguments do)
#       --flag ARG  DESCRIPTION     four-space indent under a command: one
#                                   of its flags (its own continuation
#                                   lines follow it)
#   Free text                       column 0: notes, kept as paragraphs
# Values: the word after a flag is its value when it looks like one
# (capitals, digits, `,`, `:` or `|`); a `a|b|c` value, or one opening an
# option's description, is the list of choices (completed); FILE, F and
# DIR values complete paths.

function trim(s) {
  sub(/^[ \t]+/, "", s)
  sub(/[ \t]+$/, "", s)
  return s
}

# roff text: backslashes, leading dots and quotes, and hyphens as minus
function roff(s) {
  gsub(/\\/, "\\e", s)
  gsub(/-/, "\\-", s)
  if (s ~ /^[.']/)
    s = "\\&" s
  return s
}

# the head of item line s (its leading two spaces removed) and its
# description, into H and D
function split_item(s, is_opt,   p) {
  p = index(s, "  ")
  if (p > 0) {
    H = substr(s, 1, p - 1)
    D = trim(substr(s, p))
  } else if (is_opt && length(s) > 26 && substr(s, 26, 1) == " " &&
             substr(s, 27, 1) != " ") {
    H = trim(substr(s, 1, 25))
    D = substr(s, 27)
  } else {
    H = s
    D = ""
  }
}

BEGIN {
  n_syn = 0
  n_items = 0
  n_notes = 0
  n_known = 0
  n_subs = 0
  in_usage = 0
}

NR == 1 && /^usage: / {
  syn[++n_syn] = substr($0, 8)
  in_usage = 1
  next
}
in_usage && /^    / {
  syn[++n_syn] = trim($0)
  next
}
{ in_usage = 0 }
/^  [^ ]/ {
  s = substr($0, 3)
  is_opt = s ~ /^-/
  split_item(s, is_opt)
  n_items++
  head[n_items] = H
  desc[n_items] = D
  opt[n_items] = is_opt
  last_sub = 0
  next
}
/^    --/ && n_items > 0 && !opt[n_items] && !after_items {
  split_item(trim($0), 1)
  n_subs++
  shead[n_subs] = H
  sdesc[n_subs] = D
  sowner[n_subs] = n_items
  last_sub = n_subs
  next
}
/^   / && n_items > 0 && !after_items {
  t = trim($0)
  if (last_sub && sdesc[last_sub] != "") {
    sdesc[last_sub] = sdesc[last_sub] " " t
    next
  }
  if (last_sub) {
    shead[last_sub] = shead[last_sub] " " t
    next
  }
  if (desc[n_items] != "")
    desc[n_items] = desc[n_items] " " t
  else
    head[n_items] = head[n_items] " " t
  next
}
/^[^ ]/ {
  if (n_items > 0)
    after_items = 1
  notes[++n_notes] = $0
  next
}

# ---- flags of a head, for completion: FLAGS (space-separated, in order),
# and for each flag that takes a value VAL[flag], its placeholder or
# choices (where one flag appears several times: choices over a file over
# a directory over anything else); KNOWN lists the flags in order
function scan_flags(h, d, is_opt,   n, w, i, f, a, dd) {
  FLAGS = ""
  n = split(h, w, / +/)
  for (i = 1; i <= n; i++) {
    f = w[i]
    sub(/^[[(]+/, "", f)
    sub(/[]),]+$/, "", f)
    if (f !~ /^--[a-z0-9][a-z0-9-]*$/)
      continue
    if (index(FLAGS " ", " " f " ") == 0)
      FLAGS = FLAGS " " f
    if (!(f in SEEN)) {
      SEEN[f] = 1
      KNOWN[++n_known] = f
    }
    a = (i < n) ? w[i + 1] : ""
    sub(/[]),]+$/, "", a)
    # a value looks like one: N, FILE, H:P, 1,2,3, a|b (not "only" in
    # "(--dynamic only)", nor the next flag)
    if (a == "" || a ~ /^[[(|]/ || a ~ /^--/ || a !~ /[A-Z0-9|,:]/)
      continue
    i++
    if (is_opt && d ~ /^[a-z0-9]+(\|[a-z0-9]+)+:?( |$)/) {
      split(d, dd, /[ :]/)
      a = dd[1] # --log-level L  debug|info|warn|error (default info)
    }
    if (!(f in VAL) || rank(a) > rank(VAL[f]))
      VAL[f] = a
  }
}

function rank(a) {
  return a ~ /\|/ ? 3 : a ~ /^(FILE|F)$/ ? 2 : a == "DIR" ? 1 : 0
}

# the compgen arguments that complete the value of flag f
function value_words(f,   a, c, n, i, out) {
  a = VAL[f]
  if (a ~ /\|/) {
    n = split(a, c, /\|/)
    out = ""
    for (i = 1; i <= n; i++) {
      sub(/:.*$/, ":", c[i])
      if (c[i] ~ /^[a-z0-9][a-z0-9:-]*$/)
        out = out " " c[i]
    }
    return "-W \"" trim(out) "\""
  }
  if (a ~ /^(FILE|F)$/)
    return "-f"
  if (a ~ /^DIR$/)
    return "-d"
  return ""
}

function emit_bash(   fn, i, j, f, all_opts, cmds, globals, g, cases, w, n,
                      valued, kinds) {
  fn = "_" prog
  gsub(/[^A-Za-z0-9_]/, "_", fn)
  print "# bash completion for " prog ", generated from `" prog " --help`"
  print "# by packaging/helpdoc.awk at build time: do not edit."
  # global flags: the usage line's, or every option item's
  for (i = 1; i <= n_syn; i++) {
    scan_flags(syn[i], "", 0)
    globals = globals FLAGS
  }
  for (i = 1; i <= n_items; i++) {
    scan_flags(head[i], desc[i], opt[i])
    if (opt[i]) {
      all_opts = all_opts FLAGS
    } else {
      split(head[i], w, / /)
      cmds = cmds " " w[1]
      cmdflags[w[1]] = trim(FLAGS)
      for (j = 1; j <= n_subs; j++) {
        if (sowner[j] != i)
          continue
        scan_flags(shead[j], sdesc[j], 1)
        cmdflags[w[1]] = trim(cmdflags[w[1]] FLAGS)
      }
    }
  }
  globals = trim(globals all_opts)
  cmds = trim(cmds)
  # value completions: one case per flag that takes a value
  for (i = 1; i <= n_known; i++) {
    f = KNOWN[i]
    if (!(f in VAL))
      continue
    kinds = value_words(f)
    if (kinds == "")
      valued = valued "|" f
    else
      cases = cases "    " f ") COMPREPLY=($(compgen " kinds " -- \"$cur\")); return ;;\n"
  }
  print fn "() {"
  print "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}"
  print "  local cmd= i"
  if (cmds != "") {
    print "  # the command: the first word that is neither a global option"
    print "  # nor the value of one"
    print "  for ((i = 1; i < COMP_CWORD; i++)); do"
    print "    case ${COMP_WORDS[i]} in"
    g = ""
    n = split(globals, w, / /)
    for (i = 1; i <= n; i++)
      if (w[i] in VAL)
        g = g (g == "" ? "" : "|") w[i]
    if (g != "")
      print "      " g ") ((i++)) ;;"
    print "      -*) ;;"
    print "      *) cmd=${COMP_WORDS[i]}; break ;;"
    print "    esac"
    print "  done"
  }
  print "  COMPREPLY=()"
  print "  case $prev in"
  printf "%s", cases
  if (valued != "")
    print "    " substr(valued, 2) ") return ;; # a value of its own"
  print "  esac"
  if (cmds == "") {
    print "  COMPREPLY=($(compgen -W \"" globals "\" -- \"$cur\"))"
  } else {
    print "  if [[ -z $cmd ]]; then"
    print "    if [[ $cur == -* ]]; then"
    print "      COMPREPLY=($(compgen -W \"" globals "\" -- \"$cur\"))"
    print "    else"
    print "      COMPREPLY=($(compgen -W \"" cmds "\" -- \"$cur\"))"
    print "    fi"
    print "    return"
    print "  fi"
    print "  case $cmd in"
    n = split(cmds, w, / /)
    for (i = 1; i <= n; i++)
      if (cmdflags[w[i]] != "")
        print "    " w[i] ") COMPREPLY=($(compgen -W \"" cmdflags[w[i]] "\" -- \"$cur\")) ;;"
    print "  esac"
  }
  print "}"
  print "complete -F " fn " " prog
}

# the flags of command item i, as a list indented under it
function emit_man_flags(i,   j, any) {
  for (j = 1; j <= n_subs; j++) {
    if (sowner[j] != i)
      continue
    if (!any)
      print ".RS"
    any = 1
    print ".TP"
    print ".B " roff(shead[j])
    print roff(sdesc[j])
  }
  if (any)
    print ".RE"
}

function emit_man(   i, up, has_cmds, has_opts) {
  up = toupper(prog)
  print ".\\\" generated from `" prog " --help` by packaging/helpdoc.awk: do not edit"
  print ".TH " roff(up) " 1 \"" date "\" \"embps " version "\" \"User Commands\""
  print ".SH NAME"
  print roff(prog) " \\- " roff(summary)
  print ".SH SYNOPSIS"
  print ".nf"
  for (i = 1; i <= n_syn; i++)
    print (i == 1 ? "" : "       ") roff(syn[i])
  print ".fi"
  print ".SH DESCRIPTION"
  print roff(description)
  for (i = 1; i <= n_items; i++) {
    if (opt[i])
      has_opts = 1
    else
      has_cmds = 1
  }
  if (has_cmds) {
    print ".SH COMMANDS"
    for (i = 1; i <= n_items; i++) {
      if (opt[i])
        continue
      print ".TP"
      print ".B " roff(head[i])
      print (desc[i] == "" ? "" : roff(desc[i]))
      emit_man_flags(i)
    }
  }
  if (has_opts) {
    print ".SH OPTIONS"
    for (i = 1; i <= n_items; i++) {
      if (!opt[i])
        continue
      print ".TP"
      print ".B " roff(head[i])
      print roff(desc[i])
    }
  }
  if (n_notes) {
    print ".SH NOTES"
    for (i = 1; i <= n_notes; i++) {
      if (i > 1 && notes[i] ~ /^[A-Z-]/) # a new statement: a paragraph
        print ".PP"
      print roff(notes[i])
    }
  }
  print ".SH SEE ALSO"
  print roff(seealso)
  print ".PP"
  print "The README of embps: the protocol, durability, security and operations."
}

END {
  if (mode == "bash")
    emit_bash()
  else
    emit_man()
}
