; A hand-made ALFRED problem whose objects have plain names without ALFRED's numeric ids
; ("Desk", "Book1", "locDesk"), as hand-written PDDL problems name them. Goal: hold the cell phone,
; which lies in the closed drawer.
(define (problem unnumbered_study)
    (:domain alfred)
    (:objects
        agent1 - agent
        BookType - otype
        CellPhoneType - otype
        PenType - otype
        DeskType - rtype
        DrawerType - rtype
        BedType - rtype
        Book1 - object
        Book2 - object
        CellPhone - object
        Pen - object
        Desk - receptacle
        Drawer - receptacle
        Bed - receptacle
        locCenter - location
        locDesk - location
        locDrawer - location
        locBed - location
    )
    (:init
        (receptacleType Desk DeskType)
        (receptacleType Drawer DrawerType)
        (receptacleType Bed BedType)
        (objectType Book1 BookType)
        (objectType Book2 BookType)
        (objectType CellPhone CellPhoneType)
        (objectType Pen PenType)
        (canContain DeskType BookType)
        (canContain DeskType CellPhoneType)
        (canContain DeskType PenType)
        (canContain DrawerType BookType)
        (canContain DrawerType CellPhoneType)
        (canContain DrawerType PenType)
        (canContain BedType BookType)
        (canContain BedType CellPhoneType)
        (pickupable Book1)
        (pickupable Book2)
        (pickupable CellPhone)
        (pickupable Pen)
        (openable Drawer)
        (atLocation agent1 locCenter)
        (inReceptacle Book1 Desk)
        (inReceptacle Pen Desk)
        (inReceptacle Book2 Bed)
        (inReceptacle CellPhone Drawer)
        (receptacleAtLocation Desk locDesk)
        (receptacleAtLocation Drawer locDrawer)
        (receptacleAtLocation Bed locBed)
        (objectAtLocation Book1 locDesk)
        (objectAtLocation Pen locDesk)
        (objectAtLocation Book2 locBed)
        (objectAtLocation CellPhone locDrawer)
    )
    (:goal
        (exists (?o - object ?a - agent)
            (and (objectType ?o CellPhoneType) (holds ?a ?o))
        )
    )
)
