package estimator

import "container/list"

// table is a bounded map of learned ratios whose entries each belong to one tenant. Beyond its
// bound it forgets the least recently used entry of a tenant holding its fair share (the bound
// divided among the tenants present, the inserting one included) or more: the inserting
// tenant's own when it holds that much, else the tenant holding the most (it holds at least the
// average, which is at least the share). A tenant that makes up model names on a gateway taking
// any forgets its own entries, never those of a tenant holding less than its share. Every
// operation is O(1): the tenants are kept in lists by the number of entries they hold, so the
// one holding the most is found without a scan. Not safe for concurrent use (Estimator.mu
// guards it).
type table struct {
	max      int
	entries  map[key]*list.Element // of *entry
	byTenant map[string]*owner
	// byCount[n] heads the list of the tenants holding n entries (n from 1; byCount[0] unused);
	// most is the largest n whose list is not empty (0: the table is empty).
	byCount []*owner
	most    int
}

type entry struct {
	k     key
	owner *owner
	state
}

// state is what an entry learned: the ratio, and the weight (prompt tokens by the rule, decayed)
// of the answers it was learned from (see Estimator.learn).
type state struct{ ratio, weight float64 }

// owner is a tenant's entries, most recently used first, and its links in the list
// byCount[entries.Len()].
type owner struct {
	name       string
	entries    list.List
	prev, next *owner
}

func newTable(max int) *table {
	return &table{max: max, entries: make(map[key]*list.Element), byTenant: make(map[string]*owner),
		byCount: make([]*owner, 1)}
}

// get returns k's state and marks it used.
func (t *table) get(k key) (state, bool) {
	el, ok := t.entries[k]
	if !ok {
		return state{}, false
	}
	e := el.Value.(*entry)
	e.owner.entries.MoveToFront(el)
	return e.state, true
}

// set sets k's state and marks it used; a new k belongs to tenant and, at the bound, first
// forgets an entry (see table).
func (t *table) set(k key, tenant string, s state) {
	if el, ok := t.entries[k]; ok {
		e := el.Value.(*entry)
		e.state = s
		e.owner.entries.MoveToFront(el)
		return
	}
	if len(t.entries) >= t.max {
		t.evict(tenant)
	}
	o := t.byTenant[tenant]
	if o == nil {
		o = &owner{name: tenant}
		t.byTenant[tenant] = o
	}
	t.entries[k] = o.entries.PushFront(&entry{k: k, owner: o, state: s})
	t.moved(o, o.entries.Len()-1)
}

// evict forgets the least recently used entry of tenant when it holds its fair share or more,
// else of the tenant holding the most.
func (t *table) evict(tenant string) {
	tenants := len(t.byTenant)
	victim := t.byTenant[tenant]
	if victim == nil {
		tenants++ // tenant is about to hold one
	}
	if victim == nil || victim.entries.Len()*tenants < t.max {
		victim = t.byCount[t.most]
	}
	el := victim.entries.Back()
	victim.entries.Remove(el)
	delete(t.entries, el.Value.(*entry).k)
	t.moved(victim, victim.entries.Len()+1)
	if victim.entries.Len() == 0 {
		delete(t.byTenant, victim.name)
	}
}

// moved moves o from the list of the tenants holding was entries to the one of those holding
// what it holds now (one more or one fewer), keeping most.
func (t *table) moved(o *owner, was int) {
	if was > 0 { // unlink
		if o.prev != nil {
			o.prev.next = o.next
		} else {
			t.byCount[was] = o.next
		}
		if o.next != nil {
			o.next.prev = o.prev
		}
		o.prev, o.next = nil, nil
	}
	n := o.entries.Len()
	if n > 0 { // link at the head
		if n == len(t.byCount) {
			t.byCount = append(t.byCount, nil)
		}
		o.next = t.byCount[n]
		if o.next != nil {
			o.next.prev = o
		}
		t.byCount[n] = o
	}
	switch {
	case n > t.most:
		t.most = n
	case t.byCount[t.most] == nil:
		t.most-- // o held the most and one fewer now: it heads the list below
	}
}
